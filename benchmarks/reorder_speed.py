"""Reorder speed: Algorithm 1 on a 3072×768 matrix at 50% sparsity, per M1 (median of repeats).

    python -m benchmarks.reorder_speed [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import identity_tiles, reordered_tiles, tile_stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--m1", type=int, nargs="+", default=[8, 32, 128])
    args = ap.parse_args()
    a = random_pruned(3072, 768, 0.5, np.random.default_rng(0))
    t0 = time.perf_counter()
    reordered_tiles(a, 8)  # JIT compile (or load from numba's cache)
    first = time.perf_counter() - t0
    table = Table(title=f"reorder 3072×768, 50% sparse ({a.nnz} nnz), median of {args.repeats}")
    for c in ("M1", "tiles", "median s", "min s", "max nnc identity", "max nnc reordered", "nnz COV reordered"):
        table.add_column(c)
    for m1 in args.m1:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tiles = reordered_tiles(a, m1)
            times.append(time.perf_counter() - t0)
        ident = tile_stats(identity_tiles(a, m1))
        st = tile_stats(tiles)
        table.add_row(str(m1), str(st.num_tiles), f"{statistics.median(times):.4f}", f"{min(times):.4f}",
                      str(ident.max_nnc), str(st.max_nnc), f"{st.cov_nnz:.4f}")
    console = Console(width=140)
    console.print(table)
    console.print(f"first call (includes numba JIT compile or cache load): {first:.2f} s")


if __name__ == "__main__":
    main()
