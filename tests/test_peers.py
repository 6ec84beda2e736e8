"""Processes of one trial on one machine compile once: the first compiles, its machine mates load its
executables, and the results are the ones every process compiling would give; where the first was served by
JAX's persistent cache (whose executables XLA:CPU cannot re-send), every process compiles."""

import json

import pytest
from servers import jax_processes

# 3 processes x 2 CPU devices, one machine: a sharded program with a cross-process reduction, compiled through
# jobs.peers; each reports how many programs its backend compiled, and the program's value.
WORKER = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jobs.peers import compile_once, init_distributed

compiles, hits = [], []  # programs this process compiled or took from JAX's cache; of those, the cache's
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **_: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
)
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
init_distributed(f"127.0.0.1:{sys.argv[2]}", 3, int(sys.argv[1]))
if sys.argv[3] == "cached":  # the cache back on before anything compiled: the first process may be served by it
    jax.config.update("jax_enable_compilation_cache", True)
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
sh = NamedSharding(mesh, P("d"))
f = jax.jit(lambda x: (jnp.exp(x / 64.0) * 2).sum() + x[1::2].max(), in_shardings=sh)
lower = lambda: [f.lower(jax.ShapeDtypeStruct((48,), jnp.float32, sharding=sh))]
(compiled,) = compile_once(lower, list(mesh.devices.flat))
x = jax.make_array_from_callback((48,), sh, lambda idx: np.arange(48, dtype=np.float32)[idx])
print("OUT " + json.dumps({"compiles": len(compiles), "hits": len(hits), "value": float(compiled(x))}), flush=True)
"""


def _run(cache_dir, cache: str = "as_peers_set_it") -> list[dict]:
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # the tiny program is written to the cache too
    }
    outs = jax_processes(WORKER, 3, cache, env=env)
    return [json.loads(next(ln[4:] for ln in o.splitlines() if ln.startswith("OUT "))) for o in outs]


WANT = float(sum(2 * 2.718281828459045 ** (i / 64.0) for i in range(48)) + 47)


def test_a_machines_first_process_compiles_and_its_mates_load_its_executable(tmp_path):
    want = WANT
    got = _run(tmp_path / "cache")
    assert [g["value"] for g in got] == pytest.approx([want] * 3, rel=1e-6)
    assert got[0]["compiles"] == 1 and got[0]["hits"] == 0 and [g["compiles"] for g in got[1:]] == [0, 0], got
    # the first process ran without the persistent cache: a second run compiles afresh, and still sends
    again = _run(tmp_path / "cache")
    assert [g["value"] for g in again] == pytest.approx([want] * 3, rel=1e-6)
    assert again[0]["hits"] == 0 and [g["compiles"] for g in again[1:]] == [0, 0], again


def test_an_executable_the_cache_served_is_not_sent_and_every_process_compiles(tmp_path):
    _run(tmp_path / "cache", "cached")  # the first process writes the program to the cache
    got = _run(tmp_path / "cache", "cached")  # ... and is served by it now
    assert [g["value"] for g in got] == pytest.approx([WANT] * 3, rel=1e-6)
    assert got[0]["hits"] == 1 and [g["compiles"] for g in got[1:]] == [1, 1], got
