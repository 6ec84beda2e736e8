"""One compile is one draw: libtpu's peak for the same lowered step depends on the process that compiles it
(docs/results/aot.md), so `aot_draws=k` compiles each point k times and judges by the worst draw.

Draw 1 is the plain compile (the cache entry every earlier version wrote). Draw d > 1 compiles in its own fresh
process made to differ from draw 1 the way a different calling script does: a heap holding d × 13 MiB more of
live Python objects before the step is traced, and (where Ray starts the worker) its own PYTHONHASHSEED, so
dict and set layouts differ too. Each draw is cached on its own (`.draw<d>.json`), so a rerun compiles nothing.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.plan.aot.result import CompileResult

_PAD: list[bytes] = []  # the padding stays alive for the compile: it only shifts where later objects land


def perturb(draw: int) -> None:
    """Before a draw's lowering, in its own process: make the heap differ from draw 1's (nothing for draw 1)."""
    if draw > 1:
        _PAD.extend(bytes(4096 + 977 * (i % 7)) for i in range(draw * 13 * 256))


def judged_bytes(got: CompileResult) -> int | None:
    """What a draw is judged by: the compiler's peak on the device, else the sum (or the bytes a refusal asked
    for), as verdicts.verdict judges one compile."""
    return got.device_peak or got.compiled_bytes


def worst(draws: list[CompileResult]) -> CompileResult:
    """The draw a point is judged by, with every draw's judged bytes in `draw_bytes` (in draw order): a refusal
    beats a fit (the compiler may refuse what it once fitted), then the largest figure; a failed draw says the
    point failed, since its figure is unknown."""
    if len(draws) == 1:
        return draws[0]
    if failed := [d for d in draws if d.status == "failed"]:
        return failed[0]
    rank = {"rejected": 1, "compiled": 0}
    pick = max(draws, key=lambda d: (rank[d.status], judged_bytes(d) or 0))
    return replace(pick, draw_bytes=tuple(judged_bytes(d) or 0 for d in draws))


def spread_note(got: CompileResult) -> str:
    """'worst of 3 draws: 50.7-54.4 GiB, spread 7.3%' for a judged result of several draws ('' for one)."""
    figures = [b for b in got.draw_bytes if b]
    if len(got.draw_bytes) < 2 or not figures:
        return ""
    lo, hi = min(figures), max(figures)
    if lo == hi:
        return f"{len(got.draw_bytes)} draws agree"
    return f"worst of {len(got.draw_bytes)} draws: {lo / 2**30:.1f}-{hi / 2**30:.1f} GiB, spread {hi / lo - 1:.1%}"
