"""The suite's fixtures and hooks: 8 simulated CPU devices for in-process JAX, the in-process CLI, the session's
Ray, a fresh MLflow store per test (a copy of one migrated per session). What a test imports lives in modules
of its own: tests/drivers.py (the driver in a subprocess), mlflow_lookup.py, rays.py, servers.py, stores.py,
postgres.py."""

import atexit
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The session's environment, set here at import and not in a helper module or a hook: pytest imports this file
# before it collects (imports) any test module, and jax reads JAX_PLATFORMS and XLA_FLAGS once, when it is first
# imported and its backend starts; every process the suite starts inherits the rest from this one.
# The TPU tier (tests/test_tpu.py, docs/howto/tpu-vm.md) runs with CP_TEST_TPU=1 on a TPU VM: JAX then finds the
# chip itself (and keeps the CPU beside it for the dense reference); everywhere else the suite runs on CPU.
if os.environ.get("CP_TEST_TPU") != "1":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# XLA:CPU's elemental emitters instead of its MLIR fusion emitters, in this process only: with most optimisations
# off (_xla_cpu_effort below) they compile a tiny trial's step ~3x faster (all_gather on 8 devices: 2.8 s ->
# 0.9 s), and compiling is most of what the in-process tests do. Never in the processes the suite starts (they
# drop XLA_FLAGS): two trial hosts running a step compiled so hung in its cross-process collectives. A test
# marked `many_steps` runs in a fresh interpreter with the fusion emitters (pytest_pyfunc_call below).
ELEMENTAL, FUSION = "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_use_fusion_emitters=true"
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" {ELEMENTAL}"

# One compilation cache for the session: in-process jobs, CLI subprocesses and their Ray workers all
# inherit it, so the same tiny trial compiled by several tests compiles once. Fresh per session: a cache
# shared across sessions once served an executable that deadlocked XLA:CPU's collectives (all-gather vs
# all-reduce rendezvous on different devices), which a fresh cache never reproduced.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="cp-orchestrator-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# One AOT compile cache for the session (orchestrator/plan/aot/cache.py), not the checkout's .cache/aot: a TPU
# compile several tests ask for runs once, and every session starts cold, as CI's fresh clone does. The tests
# about the cache itself point CP_AOT_CACHE at their own tmp_path.
if "CP_AOT_CACHE" not in os.environ:
    _aot = tempfile.mkdtemp(prefix="cp-orchestrator-test-aot-cache-")
    os.environ["CP_AOT_CACHE"] = _aot
    atexit.register(shutil.rmtree, _aot, ignore_errors=True)

# pytest-xdist's workers (pyproject.toml's addopts) inherit both caches from the controlling process, which made
# them; each compiles into its own part (a module runs wholly on one worker, so they would rarely share a program,
# and neither cache is written for two writers at once).
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("JAX_COMPILATION_CACHE_DIR", "CP_AOT_CACHE"):
        os.environ[_var] = os.path.join(os.environ[_var], _worker)
        os.makedirs(os.environ[_var], exist_ok=True)

# Ray starts its workers at nice 15: a trial's host processes would then get the CPU only when the test process
# (nice 0), or the other xdist worker's test, leaves it, and a starved host misses gloo's 30 s rendezvous with
# its peers. Every process of the suite competes at the same priority instead.
os.environ.setdefault("RAY_worker_niceness", "0")

# Ray turns token auth on for a local cluster it starts (its default since 2.5x): ray.init sets RAY_AUTH_MODE=token
# in this process, and the process keeps the mode after ray.shutdown. tests/rays.py switches Ray kinds and restores
# the environment around each start; a fake cluster started without the variable then runs without auth, and its
# workers' streamed results are refused by this process (InvalidAuthToken), so a trial's stream waits forever. Set
# for the session, with a session token (ray.cluster_utils creates none, and nothing lands in ~/.ray), every Ray
# the suite starts runs with the same mode and token, whatever order the tests run in.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

# XLA:CPU without LLVM's expensive passes in the processes the suite starts (Ray workers, CLI subprocesses), as
# in this one (_xla_cpu_effort below): their trials compile the step and run it two to a dozen times, so
# compiling dominates (tests/test_multislice.py, test_launch.py, test_multihost.py: 245 s with the full
# optimisation, 206 s without). The numbers are the same programs' (the parity tolerances are unchanged).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# The planner measures a CPU host's matmul rate per run, and on a shared 2-core machine one probe swings ~10x;
# tests pin it (the nominal 2-core figure) so a point's verdict does not depend on the neighbours' load.
# tests/test_mfu_model.py runs the probe itself.
os.environ.setdefault("CP_PLAN_CPU_TFLOPS", "0.01")

import jax  # noqa: E402
import pytest  # noqa: E402
from drivers import ROOT  # noqa: E402


@pytest.fixture(autouse=True)
def _xla_cpu_effort(request):
    """XLA:CPU without LLVM's expensive passes (jax's own switch), in this process only: the in-process tests
    compile hundreds of tiny programs that each run a step or two, so compiling dominates, and the results are
    the same programs' (parity tolerances unchanged). It does not reach the TPU compiler (libtpu's memory figures
    and compile times for the AOT tests are identical with it). The processes the suite starts get it from
    JAX_DISABLE_MOST_OPTIMIZATIONS (above). A test marked `many_steps` runs one program for hundreds of steps,
    where the full optimisation pays (test_train's 200-step recall test: 38 s with it, 65 s without)."""
    jax.config.update("jax_disable_most_optimizations", request.node.get_closest_marker("many_steps") is None)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked `many_steps` runs in a fresh pytest with XLA:CPU's fusion emitters, which this process
    turned off for good (XLA reads its flags once): their code runs hundreds of steps faster (the recall test:
    45 s with them in a fresh process, 61 s without in this one)."""
    if pyfuncitem.get_closest_marker("many_steps") is None or FUSION in os.environ["XLA_FLAGS"]:
        return None
    env = os.environ | {"XLA_FLAGS": os.environ["XLA_FLAGS"].replace(ELEMENTAL, FUSION)}
    node = f"{pyfuncitem.path}::{pyfuncitem.name}"  # under xdist the node id carries its group
    args = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-s", "-p", "no:cacheprovider", node]
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    print(res.stdout)
    if res.returncode != 0:
        pytest.fail(f"{node} in a fresh pytest:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}", pytrace=False)
    return True


@pytest.fixture
def cli(capsys):
    """The CLI in this process: `cli(args, cwd, env)` calls orchestrator.__main__.main(args) in `cwd` with `env`
    added and returns what drivers.run_cli returns (a CompletedProcess: exit code, stdout, stderr with the log
    lines). A driver's trials run on the Ray of the test's `local_ray`/`fake_tpu`/`fake_gpu` fixture (connect()
    joins the Ray that is up). The call leaves nothing behind: cwd, os.environ and the root logger are restored;
    tracking=local's relative sqlite:///mlflow.db is opened as the absolute path it names in `cwd`
    (orchestrator/tracking/store.py), so each call has a store of its own."""
    from orchestrator.__main__ import main

    def call(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
        capsys.readouterr()  # the test's own output so far is not the CLI's
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        logs = logging.StreamHandler(sys.stderr)  # as `python -m orchestrator` shows them (basicConfig)
        root = logging.getLogger()
        root.addHandler(logs)
        try:
            os.chdir(cwd)
            os.environ.update(env or {})
            code = main(list(args))
        finally:
            root.removeHandler(logs)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return call


@pytest.fixture(scope="session")
def rays():
    """The session's one Ray at a time (tests/rays.py); left down at the end."""
    from rays import Rays

    r = Rays()
    yield r
    r.release()


@pytest.fixture
def local_ray(rays):
    """The session's local Ray, for in-process drivers on cluster=local, local_multihost, local_multislice."""
    return rays.use("local")


@pytest.fixture
def fake_tpu(rays):
    """The session's fake TPU cluster (conf/cluster/local_fake_tpu: 2 v5p-16 slices x 2 hosts); its ClusterSpec."""
    return rays.use("fake_tpu")


@pytest.fixture
def fake_gpu(rays):
    """The session's fake GPU cluster (conf/cluster/local_fake_gpu: 2 nodes x 4 GPUs); its ClusterSpec."""
    return rays.use("fake_gpu")


@pytest.fixture
def no_ray(rays):
    """No Ray in this process when the test starts (it starts its own), nor after it."""
    rays.release()
    yield
    rays.release()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook turns the groups below into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The session's Ray switches kinds seldom: modules without a Ray first, then by the last kind they use and
    then the first (a module that uses several kinds runs just before the modules of only its last kind), and
    within a module its tests by kind; otherwise in file order.

    Under pytest-xdist (`--dist loadgroup`, pyproject.toml) a module runs wholly on one worker, in that order (its
    module-scoped fixtures are made once), and every module with a test on Ray runs on the same worker, one after
    another: two Rays on one machine clash (ports, and Ray's native code crashed under it), and the session's Ray
    starts each kind once. The other worker takes the modules without Ray meanwhile."""

    ray_fixtures = ("no_ray", "local_ray", "fake_tpu", "fake_gpu")  # the order their tests run in

    def kind(item) -> int:
        return next((i for i, f in enumerate(ray_fixtures) if f in item.fixturenames), -1)

    def uses_ray(item) -> bool:  # the session's Ray (a Ray fixture), or a Ray of its own (marked `ray`)
        return item.get_closest_marker("ray") is not None or "rays" in item.fixturenames

    modules: dict[Path, list[int]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(kind(item))
    rank = {
        m: (max(ks), min(k for k in ks if k >= 0)) if max(ks) >= 0 else (-1, -1) for m, ks in modules.items()
    }
    order = {m: i for i, m in enumerate(modules)}
    items.sort(key=lambda it: (rank[it.path], order[it.path], kind(it)))
    # xdist's public grouping mark: under `--dist loadgroup` a worker takes each group whole; without xdist's
    # workers (`-n 0`) the mark does nothing.
    if config.pluginmanager.hasplugin("xdist"):
        on_ray = {item.path for item in items if uses_ray(item)}
        for item in items:
            item.add_marker(pytest.mark.xdist_group("ray" if item.path in on_ray else item.path.stem))


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """One sqlite store migrated to MLflow's head schema for the session (tests/stores.py); tests take copies."""
    from stores import sqlite_template

    return sqlite_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture
def store(tmp_path, migrated_sqlite):
    """A fresh sqlite MLflow store URI: tmp_path/mlflow.db, which is also the store of a driver run in tmp_path
    with tracking=local (./mlflow.db)."""
    from stores import sqlite_copy

    return sqlite_copy(migrated_sqlite, tmp_path / "mlflow.db")


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session (tests/postgres.py); a test takes a fresh database of it."""
    from postgres import Postgres, bin_dir

    if bin_dir() is None:
        if os.environ.get("CP_TEST_POSTGRES") == "required":  # .ci/run installs it: missing is a failure
            pytest.fail("PostgreSQL is not installed, and CP_TEST_POSTGRES=required")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    pg = Postgres().start()
    yield pg
    pg.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request, tmp_path):
    """A fresh MLflow store URI on each SQL backend: sqlite, and PostgreSQL as the deployed server's."""
    if request.param == "sqlite":
        return request.getfixturevalue("store")
    return request.getfixturevalue("postgres").database(f"t_{os.urandom(6).hex()}")


@pytest.fixture(scope="module")
def no_ray_no_mlflow(tmp_path_factory):
    """A PYTHONPATH whose `ray` and `mlflow` fail on import: bad input must be rejected before either loads."""
    root = tmp_path_factory.mktemp("poison")
    for name in ("ray", "mlflow"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} imported before validation')\n")
    return {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}


@pytest.fixture
def pinned_cpu_peak(monkeypatch):
    """cluster=local plans with the host's measured matmul rate; pin it so verdicts do not follow the load."""
    from jobs.hardware import CPU_PEAK_ENV
    from orchestrator.plan import cluster_model

    monkeypatch.setenv(CPU_PEAK_ENV, str(cluster_model.NOMINAL_CPU_TFLOPS))
    cluster_model.measured_cpu_tflops.cache_clear()
    yield
    cluster_model.measured_cpu_tflops.cache_clear()


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory) -> Path:
    """A real tokenized corpus without a download: 300 of the standard library's own files, a 512-entry BPE."""
    from jobs.data.documents import corpus

    out = tmp_path_factory.mktemp("corpus") / "stdlib"
    corpus.build(str(out), [corpus.stdlib_dir()], vocab=512, fmt="arrayrecord", max_docs=300, shard_docs=100)
    return out


@pytest.fixture
def gcs(monkeypatch):
    """A GCS emulator for the real clients (gcsfs, google-cloud-storage); yields its bucket, gs://cp-test."""
    from servers import start_gcs_emulator

    url, stop = start_gcs_emulator(bucket="cp-test")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    yield "gs://cp-test"
    stop()
