"""The sweep report: figures from specs, summaries and loss curves, with no store and no devices."""

import io
from types import SimpleNamespace

import pytest
from matplotlib.figure import Figure

from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.results.report import collect, make_figures
from orchestrator.tracking.mlflow_names import memory_bytes

TINY = ModelSpec(name="tiny", vocab=256, embed=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, mlp=128)
GIB = 2**30


def make_spec(strategy: str = "ring", length: int = 1024, steps: int = 4) -> TrialSpec:
    return TrialSpec(
        model=TINY,
        mesh=MeshSpec(context=8),
        strategy=StrategySpec(name=strategy),
        context_length=length,
        train=TrainSpec(steps=steps),
        cluster=ClusterSpec(),  # local: 1 GiB of HBM per device in the planner's model
        axes=(("strategy", strategy), ("context_length", length)),
    )


def planned(predicted_bytes: int | None = None, step=None) -> SimpleNamespace:
    """What the report reads of a PlanRow: its memory, its step time and the StepTime behind it."""
    return SimpleNamespace(
        predicted_hbm_bytes_per_device=predicted_bytes,
        predicted_step_s=step.step_s if step else None,
        step=step,
    )


def fake_records(spec: TrialSpec, step_s: float = 0.5, mem: int = 2**26) -> list[dict]:
    """A start record, one step record per step and a summary, shaped like jobs/train.py's."""
    tok = spec.tokens_per_step
    recs = [
        {
            "kind": "start",
            "trial_id": spec.trial_id,
            "devices": 8,
            "compile_s": 3.0,
            "peak_tflops_per_device": 0.1,
            "peak_source": "cpu_measured_bfloat16",
            "compiled_bytes_per_device": mem,
        }
    ]
    for s in range(spec.train.steps):
        recs.append(
            {
                "kind": "step",
                "step": s,
                "loss": 6.0 - 0.1 * s,
                "grad_norm": 1.0,
                "step_time_s": step_s,
                "tokens_per_s": tok / step_s,
                "tflops_per_s_per_device": 0.01 / step_s,
                "mfu": 0.1 / step_s,
                "runtime_peak_bytes": None,
            }
        )
    recs.append(
        {
            "kind": "summary",
            "steps": spec.train.steps,
            "final_loss": recs[-1]["loss"],
            "step_time_median_s": step_s,
            "tokens_per_s": tok / step_s,
            "tflops_per_s_per_device": 0.01 / step_s,
            "mfu": 0.1 / step_s,
            "runtime_peak_bytes": None,
            "compiled_bytes_per_device": mem,
        }
    )
    return recs


@pytest.fixture
def trials():
    specs = [make_spec(s, L) for s in ("all_gather", "ring") for L in (512, 1024, 2048)]
    recs = {
        s.trial_id: fake_records(s, step_s=s.context_length / 2048, mem=s.context_length * 2**16)
        for s in specs
    }
    recs[specs[-1].trial_id] = recs[specs[-1].trial_id][:-1]  # no summary: not finished, left out
    rows = {s.trial_id: planned(s.context_length * 2**17) for s in specs}
    return collect(specs, lambda tid: recs.get(tid, []), rows)


def test_collect_keeps_finished_trials_with_curves(trials):
    assert len(trials) == 5
    t = trials[0]
    assert [s for s, _ in t.losses] == [0, 1, 2, 3] and t.losses[0][1] == 6.0
    assert t.predicted_bytes == t.spec.context_length * 2**17
    assert t.measured_bytes == t.spec.context_length * 2**16
    assert t.peak_source == "cpu_measured_bfloat16"


def test_make_figures_plots_what_the_driver_holds(trials):
    figs = make_figures(trials)
    assert set(figs) == {"mfu_vs_context", "memory_vs_context", "step_time_vs_context", "loss_curves"}
    assert all(isinstance(f, Figure) for f in figs.values())

    ax = figs["mfu_vs_context"].axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) == {"all_gather", "ring"}
    assert list(lines["all_gather"].get_xdata()) == [512, 1024, 2048]
    assert list(lines["ring"].get_ydata()) == pytest.approx([0.1 / 0.25, 0.1 / 0.5])
    assert ax.get_xscale() == "log" and "cpu_measured" in ax.get_ylabel()

    mem = figs["memory_vs_context"].axes[0]
    labels = [ln.get_label() for ln in mem.get_lines()]
    assert "ring program" in labels and "ring predicted" in labels
    assert not any("runtime" in x for x in labels)  # CPU reports no runtime peak
    hbm = [ln for ln in mem.get_lines() if ln.get_label().startswith("HBM")]
    assert len(hbm) == 1 and list(hbm[0].get_ydata()) == [1.0, 1.0]  # the 1 GiB device line
    measured = next(ln for ln in mem.get_lines() if ln.get_label() == "ring program")
    assert list(measured.get_ydata()) == pytest.approx([512 * 2**16 / GIB, 1024 * 2**16 / GIB])

    st = figs["step_time_vs_context"].axes[0]
    assert st.get_xscale() == "log" and st.get_yscale() == "log"

    # a panel per context length, a curve per strategy, each strategy in its colour of every other plot
    loss_axes = figs["loss_curves"].axes
    assert [a.get_title() for a in loss_axes] == ["L=512", "L=1,024", "L=2,048"]
    assert [len(a.get_lines()) for a in loss_axes] == [2, 2, 1]  # ring's 2,048 did not finish
    colour = {k: ln.get_color() for k, ln in lines.items()}
    assert {ln.get_label(): ln.get_color() for ln in loss_axes[0].get_lines()} == colour
    assert colour["all_gather"] != colour["ring"]

    for f in figs.values():  # each renders to a PNG (Agg, no display)
        buf = io.BytesIO()
        f.savefig(buf, format="png")
        assert buf.getvalue()[:4] == b"\x89PNG"


def test_steps_that_vary_get_error_bars_from_their_spread():
    spec = make_spec("ring", 1024, steps=10)
    recs = fake_records(spec, step_s=0.5)
    for i, r in enumerate(r for r in recs if r["kind"] == "step"):
        r["step_time_s"] = 0.4 + 0.02 * i  # 0.40 .. 0.58 s
    [t] = collect([spec], lambda _: recs)
    assert t.step_spread == pytest.approx((0.42, 0.56))  # p10 and p90 of the ten
    st = make_figures([t])["step_time_vs_context"].axes[0]
    [bars] = [c for c in st.collections if c.get_segments()]
    [(lo, hi)] = [(seg[0][1], seg[1][1]) for seg in bars.get_segments()]
    assert (lo, hi) == pytest.approx((0.42, 0.56))  # the median 0.5 s, its bar from p10 to p90
    [one] = collect([spec], lambda _: fake_records(spec, step_s=0.5)[:3] + fake_records(spec)[-1:])
    assert one.step_spread is None  # two timed steps: no spread to draw


def test_no_finished_trial_no_figures():
    assert make_figures([]) == {}


def test_strategies_on_several_meshes_get_separate_series():
    a, b = make_spec("ring", 1024), make_spec("ring", 2048)
    b2 = TrialSpec(**{**b.__dict__, "mesh": MeshSpec(context=4, data=2)})
    recs = {s.trial_id: fake_records(s) for s in (a, b, b2)}
    figs = make_figures(collect([a, b, b2], recs.__getitem__))
    labels = sorted(
        ln.get_label() for ln in figs["mfu_vs_context"].axes[0].get_lines() if ln.get_label()[0] != "_"
    )
    assert labels == ["ring context8", "ring data2xcontext4"]


def test_a_sweep_over_models_names_each_series_and_run_by_its_model():
    from orchestrator.tracking.mlflow_names import spec_label

    gemma = ModelSpec(
        **{**TINY.__dict__, "name": "tiny_gemma", "attention_pattern": ("local", "global"), "window": 32}
    )
    specs = [
        TrialSpec(
            **{
                **make_spec("ring", L).__dict__,
                "model": m,
                "axes": (("model", m.name), ("context_length", L)),
            }
        )
        for m in (TINY, gemma)
        for L in (512, 1024)
    ]
    recs = {s.trial_id: fake_records(s) for s in specs}
    figs = make_figures(collect(specs, recs.__getitem__))
    mfu = figs["mfu_vs_context"].axes[0]
    assert sorted(ln.get_label() for ln in mfu.get_lines() if ln.get_label()[0] != "_") == [
        "tiny ring",
        "tiny_gemma ring",
    ]
    assert "tiny, tiny_gemma on local" in mfu.get_title()
    # a model axis names the model in the run's name and the progress line; a one-model sweep's stay as they were
    assert spec_label(specs[2], "run") == "ring-L512-context8-tiny_gemma"
    assert spec_label(specs[2]) == "ring L=512 context8 tiny_gemma"
    assert spec_label(make_spec("ring", 512), "run") == "ring-L512-context8"


def test_loss_by_position_is_a_metric_and_a_parent_plot():
    from jobs.records import StepRecord, SummaryRecord
    from orchestrator.results.report import TrialResult, position_figure
    from orchestrator.tracking.mlflow_names import record_points

    rec = StepRecord(step=3, t_ms=1, loss=2.0, loss_by_position={"0-256": 2.5, "256-1K": 1.5})
    names = {p.key: p.value for p in record_points(rec, now=1)}
    assert names["loss_by_position/0-256"] == 2.5 and names["loss_by_position/256-1K"] == 1.5
    specs = [make_spec(s, L) for s in ("ring", "usp") for L in (1024, 4096)]
    trials = [
        TrialResult(s, SummaryRecord(), by_position={"0-256": 3.0, "256-1K": 2.0, "1K-4K": 1.0})
        for s in specs
    ]
    fig = position_figure(trials)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["L=1,024", "L=4,096"]  # a panel per length
    assert all(len(ax.lines) == 2 for ax in axes)  # a line per strategy
    xs = sorted(x for line in axes[0].lines for x in line.get_xdata())
    assert xs == [256, 256, 1024, 1024]  # each bucket at its end; the 1K row has no 1K-4K bucket
    assert position_figure([TrialResult(specs[0], SummaryRecord())]) is None


def test_recall_accuracy_by_distance_is_a_metric_and_a_parent_plot():
    from jobs.records import StepRecord, SummaryRecord
    from orchestrator.results.report import TrialResult, _last_steps, make_figures
    from orchestrator.tracking.mlflow_names import record_points

    recs = [
        StepRecord(step=i, t_ms=1, loss=2.0, accuracy_by_distance={"0-256": a, "256-1K": 0.5})
        for i, a in enumerate((0.1, 0.2, 0.4, 0.6))
    ]
    names = {p.key: p.value for p in record_points(recs[-1], now=1)}
    assert names["accuracy_by_distance/0-256"] == 0.6 and names["accuracy_by_distance/256-1K"] == 0.5
    assert _last_steps(recs, "accuracy_by_distance") == pytest.approx({"0-256": 0.4, "256-1K": 0.5})
    spec = make_spec("ring", 1024)
    figs = make_figures([TrialResult(spec, SummaryRecord(), by_distance={"0-256": 0.4, "256-1K": 0.5})])
    assert "accuracy_by_distance" in figs and "loss_by_position" not in figs
    (ax,) = figs["accuracy_by_distance"].axes
    assert list(ax.lines[0].get_ydata()) == [0.4, 0.5]


def test_profiled_trials_get_a_measured_vs_predicted_plot():
    """A trial whose records hold a profile (run.profile_steps) gets two stacked bars on the parent's
    plots/measured_vs_predicted.png: the model's terms at the trial's own peak, and the trace's seconds."""
    from orchestrator.plan.steptime import step_time
    from orchestrator.results import measured_vs_predicted

    spec = make_spec("ring", 1024)
    seconds = {
        "matmul": 0.1,
        "attention": 0.05,
        "collective_permute": 0.2,
        "other_compute": 0.02,
        "idle": 0.03,
    }
    prof = {"kind": "profile", "first_step": 2, "last_step": 2, "step_s": 0.4, "seconds": seconds}
    (t,) = collect([spec], lambda tid: [*fake_records(spec), prof])
    assert t.profile is not None and t.profile.seconds == seconds
    fig = make_figures([t])["measured_vs_predicted"]
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(
        measured_vs_predicted.GROUPS
    )  # predicted then measured, one segment per group
    heights = [b.get_height() for b in bars]
    want = measured_vs_predicted.predicted_groups(
        step_time(spec, peak=0.1)
    )  # the start record's measured peak
    assert heights[: len(measured_vs_predicted.GROUPS)] == pytest.approx(list(want.values()))
    assert heights[len(measured_vs_predicted.GROUPS) :] == pytest.approx([0.1, 0.05, 0.2, 0.0, 0.05])
    assert [tick.get_text() for tick in fig.axes[0].get_xticklabels()] == ["ring 1,024"]


def test_a_runtime_counter_is_drawn_beside_the_program_and_planned_memory():
    spec = make_spec("ring", 1024)
    recs = fake_records(spec, mem=2**27)
    recs[-1]["runtime_peak_bytes"] = 3 * 2**26  # a TPU or GPU backend reports its allocator's counter
    (t,) = collect([spec], lambda tid: recs, {spec.trial_id: planned(2**28)})
    lines = {
        ln.get_label(): list(ln.get_ydata())
        for ln in make_figures([t])["memory_vs_context"].axes[0].get_lines()
    }
    assert lines["ring program"] == pytest.approx([0.125])
    assert lines["ring runtime counter"] == pytest.approx([0.1875])
    assert lines["ring predicted"] == pytest.approx([0.25])


def test_the_plans_terms_are_drawn_unless_the_trial_ran_at_another_peak(monkeypatch):
    """A chip with a spec-sheet peak ran at the plan's rate: its breakdown bars are the PlanRow's StepTime, and
    the step-time model is not run again. A CPU trial measured its own rate: re-priced at that, once."""
    from orchestrator.plan import steptime
    from orchestrator.results import measured_vs_predicted

    tpu = make_spec("ring", 1024)
    tpu = TrialSpec(**{**tpu.__dict__, "cluster": ClusterSpec(peak_tflops_per_device=459.0)})
    cpu = make_spec("ring", 2048)
    terms = {s.trial_id: steptime.step_time(s) for s in (tpu, cpu)}
    prof = {"kind": "profile", "first_step": 2, "last_step": 2, "step_s": 0.4, "seconds": {"matmul": 0.1}}
    calls = []
    real = steptime.step_time
    monkeypatch.setattr(steptime, "step_time", lambda spec, **kw: calls.append(kw) or real(spec, **kw))
    recs = {s.trial_id: [*fake_records(s), prof] for s in (tpu, cpu)}
    got = collect([tpu, cpu], recs.__getitem__, {t: planned(step=st) for t, st in terms.items()})
    assert got[0].terms is terms[tpu.trial_id] and got[0].predicted_step_at_run_s is None
    assert calls == [{"peak": 0.1}]  # the CPU trial only, at the peak its start record measured
    assert got[1].terms.peak_tflops == 0.1 and got[1].predicted_step_at_run_s == got[1].terms.step_s
    bars = make_figures(got)["measured_vs_predicted"].axes[0].patches
    heights = [b.get_height() for b in bars][
        : len(measured_vs_predicted.predicted_groups(terms[tpu.trial_id]))
    ]
    assert heights == pytest.approx(
        list(measured_vs_predicted.predicted_groups(terms[tpu.trial_id]).values())
    )


def test_the_programs_peak_is_the_memory_figure_where_the_compiler_gives_it():
    """On TPU the start and summary carry the compiler's peak (program_peak_bytes): the plot, the gate and the
    dashboard's memory_bytes_per_device show it, never the runtime's counter, which misses the temporaries."""
    spec = make_spec("ring", 1024)
    recs = fake_records(spec, mem=2**27)
    recs[-1]["program_peak_bytes"] = 5 * 2**26
    recs[-1]["runtime_peak_bytes"] = 2**26
    (t,) = collect([spec], lambda tid: recs, {spec.trial_id: planned(2**28)})
    assert t.summary.program_peak_bytes == 5 * 2**26 and memory_bytes(t.summary) == 5 * 2**26
    line = {
        ln.get_label(): list(ln.get_ydata())
        for ln in make_figures([t])["memory_vs_context"].axes[0].get_lines()
    }
    assert line["ring program"] == pytest.approx([0.3125])
