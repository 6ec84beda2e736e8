"""Load balance of packed documents under context parallelism: per-device work of contiguous, zigzag, balanced.

    python benchmarks/balance.py [--corpus DIR] [--seeds 4] [--block 512] [--chunk 512] [--page [PATH]]

Document lengths come from a built corpus (`DIR/lengths.npy`, int64 token counts, as `python -m
jobs.data.documents.corpus` writes) or, without --corpus, from a proxy: the byte sizes / 4 of the Python standard
library's own *.py files (the output says which). Each row of L tokens is packed by sampling documents with
replacement (seeded) until it is full, the last one truncated; figures are averaged over --seeds rows.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from benchmarks import page
from jobs.data import balance
from orchestrator import provenance

PROG = "python benchmarks/balance.py"
LENGTHS = (65_536, 1_048_576, 14_680_064)
DEVICES = (8, 64, 128)


def stdlib_lengths() -> np.ndarray:
    """Proxy document lengths: the standard library's *.py files, 4 bytes a token (sorted paths: deterministic)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    sizes = [p.stat().st_size for p in sorted(lib.rglob("*.py")) if p.is_file()]
    return np.maximum(np.asarray(sizes, np.int64) // 4, 1)


def corpus_lengths(corpus: Path) -> np.ndarray:
    path = corpus / "lengths.npy"
    if not path.is_file():
        raise SystemExit(
            f"{path} not found: build the corpus first (python -m jobs.data.documents.corpus --out DIR)"
        )
    n = np.load(path).astype(np.int64).reshape(-1)
    n = n[n > 0]
    if not n.size:
        raise SystemExit(f"{path} holds no document of positive length")
    return n


def measure(lengths: np.ndarray, seeds: int, block: int, chunk: int) -> list[dict]:
    rows = []
    for L in LENGTHS:
        segs = [balance.sampled_row(lengths, L, seed) for seed in range(seeds)]
        docs = float(np.mean([np.unique(s).size for s in segs]))
        useful = float(np.mean([balance.useful_fraction(s) for s in segs]))
        for P in DEVICES:
            t0 = time.perf_counter()
            got = [balance.summary(s, P, block=block, chunk=chunk) for s in segs]
            secs = time.perf_counter() - t0
            row = {"L": L, "P": P, "docs": docs, "useful": useful, "seconds": secs}
            for name in balance.LAYOUTS:
                row[name] = (
                    float(np.mean([g[name].entries_ratio for g in got])),
                    float(np.mean([g[name].tiles_ratio for g in got])),
                )
            t0 = time.perf_counter()
            balance.permutation("balanced", segs[0], P, chunk=chunk)
            row["balanced_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"  L={L:,} P={P}: {secs:.1f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], block: int) -> str:
    head = ["L", "P", "documents per row", "useful fraction"]
    head += [h for n in balance.LAYOUTS for h in (f"{n} entries", f"{n} {block}-tiles")]
    cells = lambda r: [
        f"{r['L']:,}",
        r["P"],
        f"{r['docs']:.0f}",
        f"{r['useful']:.4f}",
        *(f"{r[n][i]:.3f}" for n in balance.LAYOUTS for i in (0, 1)),
        f"{r['balanced_s'] * 1e3:.0f} ms",
    ]
    return page.table([*head, "balanced layout time"], map(cells, rows))


def note(source: str, seeds: int, block: int, chunk: int) -> str:
    return f"""\
Max / mean per-device attention work of one packed row of L tokens spread over P devices (each device's L/P
queries against the whole row's keys, as all-gather and ring compute), for the three layouts of
`jobs/data/balance.py`; 1.000 is perfect balance and the step waits for the maximum. *entries*: unmasked score
entries (a query at position p of its document sees p + 1 keys). *{block}-tiles*: {block}x{block} tiles with any
unmasked entry, what a block-skipping kernel computes. *useful fraction*: unmasked entries of the document mask
over the causal row's L(L+1)/2, which MaxText's MFU counts: an MFU on that convention overstates the useful
attention work by its inverse. Balanced layout: per-document zigzag pairs, greedy largest-first assignment to
exactly L/P tokens a device, runs of at least {chunk} tokens (at most L/(8P)) except at document boundaries.
Documents: {source}; rows packed by sampling documents with replacement until full (last one truncated),
averaged over {seeds} rows (seeds 0..{seeds - 1}). *balanced layout time*: `permutation("balanced", ...)` for
one row on this host."""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=None, help="directory holding lengths.npy")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=512)
    page.add_argument(ap, "balance")
    a = ap.parse_args(argv)
    made = provenance.current(PROG, argv)  # before the run: its commit
    if a.corpus is None:
        lengths = stdlib_lengths()
        source = (
            f"PROXY, not a tokenized corpus: {lengths.size:,} Python standard library *.py files, byte size / 4 "
            f"as the token count (median {int(np.median(lengths)):,}, max {int(lengths.max()):,} tokens)"
        )
    else:
        lengths = corpus_lengths(a.corpus)
        source = (
            f"corpus {a.corpus.name}/lengths.npy, {lengths.size:,} documents (median "
            f"{int(np.median(lengths)):,}, max {int(lengths.max()):,} tokens)"
        )
    print(f"documents: {source}", flush=True)
    rows = measure(lengths, a.seeds, a.block, a.chunk)
    body = table(rows, a.block)
    if not a.page:
        print(body)
        return 0
    path = page.write(
        a.page, "Load balance of packed documents", made, note(source, a.seeds, a.block, a.chunk), body
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
