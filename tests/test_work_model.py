"""One work model priced twice: the roofline bounds the step-time model on every point, term by term."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config import grid
from orchestrator.config.load import load
from orchestrator.plan import cluster_model, plan, roofline, steptime, work

PLAN_DIR = Path(__file__).resolve().parent.parent / "orchestrator" / "plan"
POLICIES = {
    "full": [],
    "none": ["train.remat=none"],
    "save_attn": ["train.remat=save_attn"],
    "offload": ["train.remat=offload"],
    "save_attn_out": ["train.memory.save=[attn_out]"],
    "offload_layer_input": ["train.memory.offload=[layer_input]"],
    "offload_both_host": [
        "train.memory.offload=[attn_out,layer_input]",
        "train.memory.host=[optimizer,params]",
    ],
}
REL = 1e-12  # where both are bound by the same transfer they agree up to float rounding


pytestmark = pytest.mark.usefixtures("pinned_cpu_peak")


def specs(*overrides: str):
    return grid.expand(load(["dry_run=true", *overrides]))


@pytest.mark.parametrize("model", ["llama3_1_8b_long", "llama3_1_8b"])
@pytest.mark.parametrize("cluster", ["v5p_128", "tpu7x_128"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_roofline_bounds_prediction_on_every_cp_scaling_row(model, cluster, policy):
    rows = plan(specs("+sweep=cp_scaling", f"cluster={cluster}", f"model={model}", *POLICIES[policy]))
    valid = [r for r in rows if r.verdict != "invalid"]
    assert len(valid) >= 40
    over = [
        f"{r.strategy} {r.context_length:,}: predicted {r.predicted_mfu:.4f} > roofline {r.roofline_mfu:.4f}"
        for r in valid
        if r.roofline_mfu < r.predicted_mfu * (1 - REL) or r.roofline_step_s > r.predicted_step_s * (1 + REL)
    ]
    assert not over, over


def _both(spec):
    w, m = work.step_work(spec), cluster_model.model_of(spec.cluster)
    st = steptime.step_time(spec, work=w)
    rates = steptime.rates(m, spec.model.head_dim, st.peak_tflops)
    roof, model = (
        work.price(w, work.Rates(st.peak_tflops), spec.cluster, m),
        work.price(w, rates, spec.cluster, m),
    )
    return w, roof, model, st


@pytest.mark.parametrize("cluster", ["v5p_128", "tpu7x_128"])
@pytest.mark.parametrize("strategy", ["all_gather", "ring", "usp"])
def test_every_roofline_term_is_at_most_the_models(cluster, strategy):
    """Each rate of the roofline is at least the calibrated one, links included: term by term, not only in sum."""
    for policy in ("full", "save_attn", "offload_both_host"):
        for L in (8192, 1_048_576):
            (spec,) = specs(
                f"cluster={cluster}",
                "model=llama3_1_8b_long",
                f"strategy={strategy}",
                f"context_length={L}",
                *POLICIES[policy],
            )
            _, roof, model, st = _both(spec)
            assert model.step_s == st.step_s
            # compute with the transfers that hide behind it (what is exposed grows as compute shrinks)
            for group in (
                ("matmul_s", "attention_s", "calls_s", "exposed_ring_s", "exposed_fsdp_s"),
                ("collectives_s",),
                ("tensor_s",),
                ("overhead_s", "layers_s"),
            ):
                r, m = (sum(getattr(t, k) for k in group) for t in (roof, model))
                assert r <= m * (1 + REL), (policy, L, group, r, m)
            assert roof.step_s <= model.step_s * (1 + REL)


def test_train_memory_sets_what_is_replayed():
    """train.memory keeping (or offloading) the attention output spares its replay and its K,V traffic's
    fourth pass in both prices; the layer matmuls replay under any remat, the unembedding never."""
    base = ["cluster=tpu7x_128", "model=llama3_1_8b_long", "strategy=ring", "context_length=131072"]
    (full,) = specs(*base)
    (saved,) = specs(*base, "train.memory.save=[attn_out]")
    (moved,) = specs(*base, "train.memory.offload=[attn_out]")
    (none,) = specs(*base, "train.remat=none")
    (save_attn,) = specs(*base, "train.remat=save_attn")
    wf, ws, wm, wn, wa = (work.step_work(s) for s in (full, saved, moved, none, save_attn))
    assert wf.replays_attention and wf.passes == 4
    for w in (ws, wm, wn, wa):
        assert not w.replays_attention and w.passes == 3
    assert ws.attention_ring_bytes == wf.attention_ring_bytes * 3 // 4
    assert wm.host_bytes > wf.host_bytes == 0
    assert wa.fsdp_bytes == wf.fsdp_bytes > wn.fsdp_bytes  # the replayed layer gathers its weights again
    m = full.model
    unembed = 2 * full.context_length * m.embed * m.vocab * wf.per_device
    assert wf.matmul_tflop - wn.matmul_tflop == pytest.approx((wn.matmul_tflop - 3 * unembed) / 3, rel=1e-9)
    assert roofline.roofline(saved).mfu > roofline.roofline(full).mfu


def test_peak_has_one_owner():
    # imported, not redefined
    assert roofline.peak_tflops is steptime.peak_tflops is cluster_model.peak_tflops
    assert not {"measured_cpu_tflops", "NOMINAL_CPU_TFLOPS"} & set(roofline.__all__ + steptime.__all__)
    (spec,) = specs("cluster=local")
    assert cluster_model.peak_tflops(spec) == cluster_model.NOMINAL_CPU_TFLOPS  # pinned by the fixture
    tpu = replace(spec, cluster=replace(spec.cluster, peak_tflops_per_device=459.0))
    assert cluster_model.peak_tflops(tpu) == 459.0


def _imports(path: Path) -> set[str]:
    """orchestrator.plan modules a module imports at run time, at module level or inside a function (imports
    under `if TYPE_CHECKING:` never run)."""
    names = {p.stem for p in PLAN_DIR.glob("*.py") if p.stem != "__init__"}
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.plan":
            found |= {a.name if a.name in names else "__init__" for a in node.names}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found |= {
                m.split(".")[2]
                for m in mods
                if m.startswith("orchestrator.plan.") and m.split(".")[2] in names
            }
    return found


def test_no_import_cycle_in_plan():
    graph = {p.stem: _imports(p) - {p.stem} for p in PLAN_DIR.glob("*.py")}
    # A submodule importing the package runs __init__ first, which imports no submodule that imports it back.
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, (*path, node))
        done.add(node)

    for node in graph:
        visit(node, ())
    assert "steptime" not in graph["roofline"] and "roofline" not in graph["steptime"]
