"""Does a family's global layer carry the context its windows cannot see? The loss of each trial of a families
sweep by position in the document, read from its MLflow store:

    python -m orchestrator +sweep=families sweep.id=families-1
    python -m orchestrator +sweep=families sweep.id=families-local 'sweep.axes.model=[tiny_gemma]' \\
        'model.attention_pattern=[local]'                        # the ablation: Gemma's pattern, no global layer
    python benchmarks/family_positions.py families-1 families-local --uri sqlite:///mlflow.db [--page]

Each figure is the mean over the trial's last 8 steps of its loss on the tokens in one position bucket (the
token's place in its document, as the sweep's loss_by_position metrics log it).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from mlflow import MlflowClient

from benchmarks import page
from jobs.data.buckets import bucket_labels
from jobs.spec import TrialSpec
from orchestrator import provenance
from orchestrator.tracking.finished import finished_runs, run_spec

PROG = "python benchmarks/family_positions.py"
LAST = 8  # steps averaged at the end of each trial
NOTE = """Measured on this machine: the families sweep (`conf/sweep/families.yaml`: each family's attention
pattern on the tiny model, ring attention over 8 simulated CPU devices, packed documents of the standard-library
corpus, 64 steps at 1,024 tokens and 32 at 2,048) and its ablation, Gemma 3's pattern with every layer local
(`model.attention_pattern=[local]`). A local layer sees the window behind it, so six stacked windows of 32
reach at most 6 x 31 = 186 tokens back; a token deeper into its document than that is where a global layer
could help. Each cell: the loss on the tokens of that position bucket (their place in their document), mean of
the trial's last 8 steps. *loss*: the whole row's, the same steps. Tiny models this briefly trained learn mostly
short-range statistics: read the columns against one another, not as what a trained model reaches."""


def _mean_tail(client: MlflowClient, run_id: str, key: str) -> float:
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
    return statistics.fmean(v for _, v in hist[-LAST:]) if hist else float("nan")


def rows(client: MlflowClient, sweep_id: str, experiment: str) -> list[dict]:
    exp = client.get_experiment_by_name(experiment)
    out = []
    for r in finished_runs(client, exp.experiment_id, sweep_id):
        spec = run_spec(client, r.info.run_id)
        buckets = [b for b in bucket_labels(spec.context_length) if f"loss_by_position/{b}" in r.data.metrics]
        out.append(
            {
                "spec": spec,
                "loss": _mean_tail(client, r.info.run_id, "loss"),
                "at": {b: _mean_tail(client, r.info.run_id, f"loss_by_position/{b}") for b in buckets},
            }
        )
    return sorted(out, key=lambda x: (x["spec"].context_length, x["spec"].model.name))


def pattern(spec: TrialSpec) -> str:
    """'5 local : 1 global (window 32, QK-norm)': the layer types of one repeat, then what sets them apart."""
    m, kinds = spec.model, spec.model.attention_pattern
    said = " : ".join(f"{kinds.count(k)} {k}" for k in ("local", "chunked", "global") if k in kinds)
    notes = [f"window {m.window}"] * ("local" in kinds) + [f"chunk {m.chunk}"] * ("chunked" in kinds)
    notes += ["sinks"] * m.sinks + ["QK-norm"] * m.qk_norm + ["no RoPE on global"] * (not m.global_rope)
    return said + (f" ({', '.join(notes)})" if notes else "")


def table(found: list[dict]) -> str:
    """A table per context length: a row per model, a column per position bucket."""
    out = []
    for length in sorted({x["spec"].context_length for x in found}):
        here = [x for x in found if x["spec"].context_length == length]
        buckets = [b for b in bucket_labels(length) if any(b in x["at"] for x in here)]
        head = ["model", "layers", "attention per layer", "loss", *(f"at {b}" for b in buckets)]
        body = [
            [
                x["spec"].model.name,
                str(x["spec"].model.layers),
                pattern(x["spec"]),
                f"{x['loss']:.3f}",
                *(f"{x['at'].get(b, float('nan')):.3f}" for b in buckets),
            ]
            for x in here
        ]
        steps = here[0]["spec"].train.steps
        out.append(
            f"### {length:,} tokens, {steps} steps, {here[0]['spec'].strategy.name}\n\n{page.table(head, body)}"
        )
    return "\n\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="sweep ids (sweep.id) in the store")
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="cp_scaling")
    page.add_argument(ap, "family-positions")
    a = ap.parse_args(argv)
    client = MlflowClient(a.uri)
    found = [x for s in a.sweeps for x in rows(client, s, a.experiment)]
    if not found:
        print(f"no finished trial in sweeps {a.sweeps} of {a.uri}", file=sys.stderr)
        return 2
    body = table(found)
    if not a.page:
        print(body)
        return 0
    made = provenance.current(PROG, argv, load=True)
    path = page.write(a.page, "Loss by position across the model families", made, NOTE, body)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
