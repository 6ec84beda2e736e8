"""The TPU tier (`pytest -m tpu`, one process, on a TPU VM): what only the chip can show, on the chip.

- every local attention kernel the chip runs (xla, splash, and auto, which must be splash there) under every mask
  (causal, sliding window, chunk, sinks, packed segments, and all three at once) against the dense fp32
  reference: the output and dq, dk, dv (and d sinks), fp32 inputs, under jax.default_matmul_precision("highest");
- the train step of every CP strategy at CP = 1 (a mesh of one chip), three steps through jobs.train.train;
- train state in pinned host memory and remat=offload against the same trial without them;
- the memory record (compiled program, the compiler's and the runtime's peaks) against the chip's capacity.

Skipped everywhere else (CI has no accelerator): the tier runs when CP_TEST_TPU=1 and JAX sees a TPU (tests/
conftest.py then leaves JAX_PLATFORMS alone); CP_TEST_TPU=1 on a host without one is an error, not a skip.
CP_TEST_TPU_ON_CPU=1 runs every test on CPU instead (splash in Pallas interpret mode, at a shorter length), which
checks the tests themselves on a machine without a chip. How to run it: docs/howto/tpu-vm.md.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs import strategies
from jobs.attention import attention, reference_attention
from jobs.attention.kernels import splash
from jobs.spec import ClusterSpec, MemorySpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from jobs.train import train

ON_CHIP, ON_CPU = "CP_TEST_TPU", "CP_TEST_TPU_ON_CPU"


def on_tpu() -> bool:
    """Whether the tier runs here. Reads only the environment unless CP_TEST_TPU=1 (CI starts no backend for it);
    with it, JAX must see a TPU: a chip hidden by JAX_PLATFORMS=cpu fails loudly instead of skipping the tier."""
    if os.environ.get(ON_CPU) == "1":
        return True
    if os.environ.get(ON_CHIP) != "1":
        return False
    if (backend := jax.default_backend()) != "tpu":
        raise RuntimeError(
            f"{ON_CHIP}=1 asks for the TPU but JAX runs on {backend} (JAX_PLATFORMS="
            f"{os.environ.get('JAX_PLATFORMS', '')!r}): tests/conftest.py must leave JAX_PLATFORMS unset under "
            f"{ON_CHIP}=1, and the host must have a chip"
        )
    return True


pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(
        not on_tpu(), reason=f"the TPU tier: set {ON_CHIP}=1 on a TPU host ({ON_CPU}=1 runs it on CPU)"
    ),
]


def chip() -> bool:
    """The real chip (not the CPU rehearsal)."""
    return jax.default_backend() == "tpu"


def length() -> int:
    """Tokens per row: 1024 on the chip (8 x 128 lanes, two 512-token kernel blocks a side); 256 on CPU, where
    splash is interpreted (two 128-token blocks a side)."""
    return 1024 if chip() else 256


# ---- attention kernels against the dense fp32 reference -----------------------------------------------------

B, HQ, HKV, D = 2, 4, 2, 128  # GQA: 4 query heads over 2 kv heads; head_dim 128 (the MXU's width)
KERNELS = ("xla", "splash", "auto")
# Each mask as attention's arguments at row length L: the window and the chunk cut across the kernels' L/2
# blocks; documents of a row end mid-block, and differently in the two rows (the last 17 tokens of row 1 are
# padding, id 0, a document of their own).
MASKS = {
    "causal": lambda L: {},
    "window": lambda L: {"window": 3 * L // 8 + 1},
    "chunk": lambda L: {"chunk": 3 * L // 8},
    "sinks": lambda L: {"sinks": True},
    "segments": lambda L: {"segments": True},
    "segments+window+sinks": lambda L: {"segments": True, "window": L // 4 + 3, "sinks": True},
}
# Largest |kernel - reference| allowed, per kernel (auto: the kernel it resolves to) and output. Inputs are fp32
# unit normals; the kernels run fp32 on the chip, the reference fp32 on the host's CPU, matmuls at "highest"
# precision on both (~fp32 on the MXU). Measured on a v5e (2026-12-07; L = 1024, B = 2, 4 q heads over 2 kv
# heads, D = 128; largest |out| 2.5, |dq| 2.6, |dk| 3.4, |dv| 5.3, |d sinks| 7.7), the same for xla and splash to
# two digits: out <= 3.8e-6 (5.0e-5 with sinks, whose correction exp(lse - lse') scales every output); dq, dk, dv
# <= 1.9e-4 (~4e-5 of the largest gradient: 30x the forward's relative error, for both kernels alike, and as far
# from the reference run on the chip as from the CPU one; the chip's arithmetic, not a mask); d sinks <= 2.3e-4.
# On CPU (L = 256) every error is <= 1.1e-5. Each bound is 2-5x the chip's worst; a wrong mask or a missed block is
# off by 1e-2 .. 1, and one bf16 rounding of p (4e-3 relative) by ~1e-2 on these gradients.
TOL = {
    "xla": {"out": 1e-4, "dq": 5e-4, "dk": 5e-4, "dv": 5e-4, "dsinks": 1e-3},
    "splash": {"out": 1e-4, "dq": 5e-4, "dk": 5e-4, "dv": 5e-4, "dsinks": 1e-3},
}


def resolved(kernel: str) -> str:
    """The kernel that runs: auto is splash on the chip, xla elsewhere (jobs/attention/kernels/__init__.py)."""
    return ("splash" if chip() else "xla") if kernel == "auto" else kernel


def segment_ids(L: int) -> np.ndarray:
    """int32 [B, L]: row 0 three documents, row 1 three and the padding (id 0), every boundary mid-block."""
    rows = []
    for ends, pad in (([3 * L // 10, 3 * L // 4], 0), ([L // 8 + 5, L // 2 + 3], 17)):
        ids = np.searchsorted(np.asarray(ends), np.arange(L), side="right") + 1
        ids[L - pad :] = 0
        rows.append(ids)
    return np.stack(rows).astype(np.int32)


def _no_fallback(*args, **kwargs):
    raise AssertionError("splash ran the xla kernel (its fallback): the case does not exercise splash")


@functools.cache
def inputs() -> tuple[np.ndarray, ...]:
    """q, k, v, the output's cotangent (fp32 unit normals) and the sinks, drawn on the host's CPU: the same bits
    whichever backend then runs a kernel."""
    L = length()
    shapes = ((B, L, HQ, D), (B, L, HKV, D), (B, L, HKV, D), (B, L, HQ, D))
    with jax.default_device(jax.devices("cpu")[0]):
        keys = jax.random.split(jax.random.PRNGKey(0), len(shapes))
        drawn = [jax.random.normal(key, shape, jnp.float32) for key, shape in zip(keys, shapes, strict=True)]
    return (*(np.asarray(x) for x in drawn), np.linspace(-1.0, 2.0, HQ, dtype=np.float32))


@functools.cache
def outputs(kernel: str, mask: str) -> dict[str, np.ndarray]:
    """out, dq, dk, dv (and dsinks with sinks) of one mask under `kernel`, one jit of forward and backward,
    strategy none, on the chip; "reference": the dense fp32 one, on the host's CPU, a ground truth that shares
    none of the chip's arithmetic with the kernels it judges. Cached, so auto can be compared with what it
    resolves to."""
    L = length()
    m = MASKS[mask](L)
    q, k, v, ct, sinks = inputs()
    seg = segment_ids(L) if m.get("segments") else None
    span = {"window": m.get("window"), "chunk": m.get("chunk")}

    def f(q, k, v, s):
        s = s if m.get("sinks") else None
        if kernel == "reference":
            return reference_attention(q, k, v, q_seg=seg, kv_seg=seg, sinks=s, **span)
        blocks = {"block_q": L // 2, "block_kv": L // 2}
        return attention(
            q, k, v, strategy="none", mesh=None, kernel=kernel, segment_ids=seg, sinks=s, **span, **blocks
        )

    def out_and_grads(q, k, v, s, ct):
        out, vjp = jax.vjp(f, q, k, v, s)
        return (out, *vjp(ct))

    device = jax.devices("cpu")[0] if kernel == "reference" else jax.devices()[0]
    with (
        pytest.MonkeyPatch.context() as mp,
        jax.default_matmul_precision("highest"),
        jax.default_device(device),
    ):
        if resolved(kernel) == "splash":
            mp.setattr(splash, "xla_fwd", _no_fallback)
            mp.setattr(splash, "xla_bwd", _no_fallback)
        got = jax.jit(out_and_grads)(q, k, v, sinks, ct)
    names = ("out", "dq", "dk", "dv", "dsinks")[: 5 if m.get("sinks") else 4]
    return {name: np.asarray(x) for name, x in zip(names, got, strict=False)}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_the_dense_reference(kernel, mask):
    got, want = outputs(kernel, mask), outputs("reference", mask)
    assert got.keys() == want.keys()
    tol = TOL[resolved(kernel)]
    errs = {name: float(np.max(np.abs(got[name] - want[name]))) for name in want}
    print(
        f"{kernel} ({resolved(kernel)}) {mask} L={length()}: "
        + ", ".join(f"{n} {e:.1e}" for n, e in errs.items())
    )
    bad = {name: (err, tol[name]) for name, err in errs.items() if not err <= tol[name]}
    assert not bad, f"{kernel} {mask}: (max abs error, bound) {bad}"


@pytest.mark.parametrize("mask", MASKS)
def test_auto_is_the_platform_kernel(mask):
    """auto runs splash on the chip (xla on CPU): the same numbers to the bit."""
    auto, own = outputs("auto", mask), outputs(resolved("auto"), mask)
    for name in own:
        assert np.array_equal(auto[name], own[name]), (
            f"auto differs from {resolved('auto')} on {mask}: {name}"
        )


# ---- the train step on the chip -----------------------------------------------------------------------------

# A small model whose attention tiles on the TPU (head_dim 128) and whose matmuls are MXU-sized.
MODEL = ModelSpec(
    name="tpu_tier", vocab=256, embed=256, layers=2, q_heads=4, kv_heads=2, head_dim=128, mlp=512
)
# One v5e chip on one VM (conf/cluster/v5e_1.yaml), the peak given so MFU needs no spec-sheet lookup.
V5E_1 = ClusterSpec(
    name="v5e_1",
    kind="tpu",
    platform="tpu",
    accelerator="v5litepod",  # Ray's name for v5e, as conf/cluster/v5e_1.yaml
    hosts=1,
    devices_per_host=1,
    topology="1x1",
    peak_tflops_per_device=197.0,
)
# Host offload moves bytes, not arithmetic: the same trial with train state or layer inputs in pinned host memory
# runs the same ops on the same values, and its losses were equal to the bit on a v5e and on CPU (2026-12-07).
# 1e-4 on a loss near 6 leaves room for a compiler that fuses around the offload's copies differently, and for
# nothing else.
OFFLOAD_LOSS_TOL = 1e-4


def trial(strategy: str = "none", **train: object) -> TrialSpec:
    """Three steps of the recall task on one chip (every axis of the mesh 1), bf16 compute. The rate is 0 at step
    0 and 1e-3 from step 1 (warm-up 1), so step 2's batch meets the first real update: its loss is well below step
    0's (6.66 -> 4.59 on a v5e at L = 1024, 6.40 -> 5.91 on CPU at L = 256), where two batches of the same
    parameters differ by ~0.15 (step 0 vs step 1 on CPU)."""
    return TrialSpec(
        model=MODEL,
        mesh=MeshSpec(),
        strategy=StrategySpec(name=strategy),
        context_length=length(),
        train=TrainSpec(steps=3, batch=2, lr=1e-3, warmup=1, **train),  # type: ignore[arg-type]
        cluster=V5E_1,
    )


@functools.cache
def records(spec: TrialSpec) -> tuple[dict, ...]:
    """The trial's records in their dict form (what the driver receives); cached: several tests read one trial."""
    return tuple(r.to_dict() for r in train(spec))


def losses(spec: TrialSpec) -> list[float]:
    return [r["loss"] for r in records(spec) if r["kind"] == "step"]


@pytest.mark.parametrize("strategy", strategies.NAMES)
def test_train_step_of_every_strategy_at_cp_1(strategy):
    recs = records(trial(strategy))
    start, summary = recs[0], recs[-1]
    assert start["kind"] == "start" and summary["kind"] == "summary"
    assert start["platform"] == jax.default_backend() == ("tpu" if chip() else "cpu")
    assert start["devices"] == 1 and start["peak_tflops_per_device"] == 197.0
    got = losses(trial(strategy))
    print(f"{strategy}: losses {got}")
    assert len(got) == 3 and all(math.isfinite(x) for x in got), got
    assert got[2] < got[0], f"{strategy}: the loss did not fall over 3 steps: {got}"
    assert summary["final_loss"] == got[-1] and summary["mfu"] > 0


@pytest.mark.parametrize(
    "offload",
    [{"memory": MemorySpec(host=("optimizer",))}, {"remat": "offload"}],
    ids=["host=optimizer", "remat=offload"],
)
def test_host_offload_trains_like_the_trial_without_it(offload):
    """Same seed, same data, same ops: the losses of the trial without offload (remat=full, state in HBM)."""
    base, moved = trial(), trial(**offload)
    assert moved.trial_id != base.trial_id
    got, want = losses(moved), losses(base)
    print(f"{offload}: losses {got}, without offload {want}")
    np.testing.assert_allclose(got, want, rtol=0, atol=OFFLOAD_LOSS_TOL)


def bytes_limit() -> int | None:
    """The chip's usable memory (memory_stats' bytes_limit); None on CPU, which keeps no counters."""
    stats = jax.devices()[0].memory_stats()
    return int(stats["bytes_limit"]) if stats else None


def test_memory_record_fits_the_chip():
    """The start record's compiled-program memory (memory_analysis) and the compiler's peak (program_peak_bytes,
    device memory only; not recorded on CPU, whose compiler leaves its temporaries out), and the runtime's peak
    (runtime_peak_bytes) on every step and the summary: above 0 and within the chip's bytes_limit."""
    recs = records(trial())
    start, steps, summary = recs[0], [r for r in recs if r["kind"] == "step"], recs[-1]
    limit = bytes_limit()
    assert chip() == (limit is not None)
    for name in ("argument_bytes", "output_bytes", "temp_bytes", "compiled_bytes_per_device"):
        assert isinstance(start[name], int) and start[name] >= 0, (name, start[name])
    assert 0 < start["compiled_bytes_per_device"] <= (limit or math.inf), (start, limit)
    program = start.get("program_peak_bytes")
    assert summary.get("program_peak_bytes") == program
    runtime = [r["runtime_peak_bytes"] for r in (*steps, summary)]
    print(f"limit {limit}, program peak {program}, runtime peaks {runtime}")
    if not chip():  # CPU: no compiler peak recorded, no runtime counters
        assert program is None and runtime == [None] * 4
        return
    assert isinstance(program, int) and 0 < program <= limit, (program, limit)
    assert all(isinstance(r, int) and 0 < r <= limit for r in runtime), (runtime, limit)
