"""Search-space reduction (the paper's Fig. 3 in numbers): per zoo layer, (M1, N1) candidates
before and after each constraint, and per-model totals. Calls the stages directly.

    python -m benchmarks.search_space [--sparsity 0.9] [--gpu h100] [--per-layer]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from lospmm.stages.constrain import layer_candidates, reduction_counts
from lospmm.devices import device_named
from lospmm.stages.extract import ZOO_NAMES, zoo_shapes
from lospmm.stages.prune import pruned_layer
from lospmm.stages.reorder import tile_stats
from lospmm.search import DEFAULT_M1, layer_tiles

STEPS = ("total", "after_register", "after_utilisation", "after_load_balance")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--per-layer", action="store_true")
    args = ap.parse_args()
    device = device_named(args.gpu)
    console = Console(width=160)
    summary = Table(title=f"candidates left after each constraint, {args.gpu}, sparsity {args.sparsity} "
                          f"(M1 ∈ {list(DEFAULT_M1)}, N1 ∈ 32..1024 step 32)")
    for c in ("model", "GEMM shapes", *STEPS, "kept %", "min kept/layer", "max kept/layer", "seconds"):
        summary.add_column(c)
    for model in ZOO_NAMES:
        t0 = time.perf_counter()
        per_layer = Table(title=f"{model}")
        for c in ("layer", "M", "N", "K", *STEPS):
            per_layer.add_column(c)
        totals = dict.fromkeys(STEPS, 0)
        kept = []
        shapes = [s for s in zoo_shapes(model) if s.ok]
        for s in shapes:
            a = pruned_layer(s, args.sparsity).matrix
            stats = {m1: tile_stats(t) for m1, t in layer_tiles(a, s.n, DEFAULT_M1).items()}
            counts = reduction_counts(layer_candidates(s.n, stats, device, empty=a.nnz == 0))
            for k in STEPS:
                totals[k] += counts[k]
            kept.append(counts["after_load_balance"])
            per_layer.add_row(s.layer, str(s.m), str(s.n), str(s.k), *(str(counts[k]) for k in STEPS))
        if args.per_layer:
            console.print(per_layer)
        summary.add_row(model, str(len(shapes)), *(str(totals[k]) for k in STEPS),
                        f"{100 * totals['after_load_balance'] / totals['total']:.1f}", str(min(kept)), str(max(kept)),
                        f"{time.perf_counter() - t0:.1f}")
    console.print(summary)


if __name__ == "__main__":
    main()
