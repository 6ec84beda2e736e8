"""How a trial's processes meet: one JAX runtime, barriers on the coordination service (no collective), and
compiling once per machine.

Processes on one machine (a slice simulated on a laptop or a CI box, or one process per GPU of a node) would
compile the same program on the same cores, N at once taking about N times one compile; and JAX's persistent
cache cannot serve one process's executable to another on CPU (its key hashes the process's own topology). So
the lowest process of each machine compiles, and its machine mates load its executables. Processes on other
machines compile at once, as before.
"""

from __future__ import annotations

import pickle
import socket
from collections.abc import Callable

import jax
from jax.experimental.serialize_executable import deserialize_and_load, serialize

TIMEOUT_S = 3600
_MATES: list[int] = []  # this process's machine mates (init_distributed), itself included


def init_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the trial's processes into one JAX runtime (before any device is touched), and find this
    process's machine mates. A machine's first process on CPU turns JAX's persistent cache off before anything
    compiles (compile_once says why)."""
    if num_processes > 1:
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
        _MATES[:] = _machine_mates()
        if shares_compiles() and _MATES[0] == process_id and jax.devices()[0].platform == "cpu":
            jax.config.update("jax_enable_compilation_cache", False)


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def sync_hosts(name: str, timeout_s: int = TIMEOUT_S, process_ids: list[int] | None = None) -> None:
    """Wait until every process of the trial (or of `process_ids`) gets here. XLA's CPU (gloo) collectives give
    a late peer only 30 s to join a new communicator, less than the compile skew between hosts on a busy
    machine; so hosts meet here after compiling and initializing, before their first collective."""
    if jax.process_count() > 1:
        _client().wait_at_barrier(name, timeout_in_ms=timeout_s * 1000, process_ids=process_ids)


def _machine_mates() -> list[int]:
    """The trial's processes that run on this process's machine, itself included, in process order."""
    client, me = _client(), socket.gethostname()
    client.key_value_set(f"cp_machine/{jax.process_index()}", me)
    sync_hosts("cp_machines")
    return sorted(
        int(key.rpartition("/")[2]) for key, where in client.key_value_dir_get("cp_machine/") if where == me
    )


def shares_compiles() -> bool:
    """Whether this process shares a machine with others of its trial, so compile_once compiles there once."""
    return len(_MATES) > 1


def compile_once(lower: Callable[[], list[jax.stages.Lowered]], devices: list) -> list[jax.stages.Compiled]:
    """The programs `lower()` gives, compiled: here, or, on a machine's later processes, loaded from what its
    first process compiled (sent through the coordination service with their argument and result trees, so
    these processes do not even trace them). `devices`: the programs' devices in mesh order (they share one
    mesh). Where the first process cannot send an executable, every process compiles."""
    if not shares_compiles():
        return [low.compile() for low in lower()]
    client, key = _client(), f"cp_executables/{_MATES[0]}"
    if jax.process_index() == _MATES[0]:
        lowered = lower()
        compiled, fresh = _compile_fresh(lowered)
        client.key_value_set_bytes(key, _payload(lowered, compiled) if fresh else b"")
        return compiled
    sent = client.blocking_key_value_get_bytes(key, TIMEOUT_S * 1000)
    if not sent:
        return [low.compile() for low in lower()]
    return [deserialize_and_load(*one, execution_devices=devices) for one in pickle.loads(sent)]


def _compile_fresh(lowered: list[jax.stages.Lowered]) -> tuple[list[jax.stages.Compiled], bool]:
    """(the executables, whether all were compiled here, not served by JAX's persistent cache). A cached one
    cannot be sent: XLA:CPU re-serializes it without some of its kernels ("Function ... not found" where it
    runs). So a machine's first process on CPU runs without that cache (init_distributed), where it would only
    serve that one process (the others' keys hash their own topology); a hit is still watched for."""
    hits = []

    def watch(event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(watch)
    try:
        return [low.compile() for low in lowered], not hits
    finally:
        jax.monitoring.unregister_event_listener(watch)


def _payload(lowered: list[jax.stages.Lowered], compiled: list[jax.stages.Compiled]) -> bytes:
    """Each executable, serialized, with its argument and result trees; empty where one cannot be (host
    callbacks, constants): compile yourselves."""
    try:
        return pickle.dumps(
            [(serialize(c)[0], low.in_tree, low.out_tree) for low, c in zip(lowered, compiled, strict=True)]
        )
    except (ValueError, NotImplementedError, pickle.PicklingError):
        return b""
